"""pygit2 as pinwheel uses it: every module takes pygit2 from here.

``from pinwheel.source.libgit2 import pygit2`` imports libgit2's binding and, the
first time, sets it up under the git policy before any call can reach a repository:
no global, XDG, system or program-data config (:func:`pinwheel.source.gitpolicy.apply_libgit2`),
and no strict object creation (replay writes trees that may name blobs a partial mirror
lacks, whose ids are known-good). Modules on the warm ``pinwheel run`` path import it
where they call libgit2, so a replay answered from its stamp never loads libgit2.
"""

from __future__ import annotations

import pygit2 as pygit2

from pinwheel.source.gitpolicy import apply_libgit2

__all__ = ["pygit2"]

apply_libgit2(pygit2)
pygit2.settings.enable_strict_object_creation(False)
