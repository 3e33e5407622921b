"""Where a Python's torch and nvidia packages live (compile/headerview.py): NAME<TAB>PATH lines."""

import importlib.util as u
import os

for name in ("torch", "nvidia"):
    try:
        spec = u.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        print(name + "\t" + os.path.realpath(loc))
