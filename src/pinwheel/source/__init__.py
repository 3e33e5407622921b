"""Stage 1, source: a manifest in, a replayed tree out.

Fetch into the cache, replay the stack in memory (same SHAs anywhere), plan,
lock, drift, resolve conflicts as patches, export the tree.
"""
