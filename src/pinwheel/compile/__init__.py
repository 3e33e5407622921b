"""Stage 2, compile: a replayed tree in, wheels out through the wheel-set contract.

Toolchain provisioning, the build environments, component and engine builds, the
kept workspaces and compiler cache. Checking, SHA256SUMS and provenance belong to
`pinwheel.wheels`, which this stage publishes through.
"""
