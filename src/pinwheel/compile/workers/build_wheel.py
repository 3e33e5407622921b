"""A kernel tree's PEP 517 ``build_wheel`` alone, in the build's Python (compile/frontend.py).

Arguments: OUT BACKEND BACKEND_PATHS_JSON SETTINGS_JSON. Prints the wheel's name.
"""

import importlib
import json
import os
import sys

out, backend = sys.argv[1], sys.argv[2]
paths, settings = json.loads(sys.argv[3]), json.loads(sys.argv[4])
for p in reversed(paths):
    sys.path.insert(0, os.path.abspath(p))
module, _, attrs = backend.partition(":")
hooks = importlib.import_module(module)
for attr in filter(None, attrs.split(".")):
    hooks = getattr(hooks, attr)
name = hooks.build_wheel(out, settings or None)
print("pinwheel-frontend-wheel: " + name)
