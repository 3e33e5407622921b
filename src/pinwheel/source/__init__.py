"""Stage 1, source: a manifest in, a replayed tree out.

Fetch into the cache, replay the stack in memory (same SHAs anywhere), plan,
lock, drift, resolve conflicts as patches, export the tree.
"""

# Every libgit2 call runs under the git policy (no global/system config): applied on import.
from pinwheel.source import gitpolicy as _gitpolicy  # noqa: E402, F401
