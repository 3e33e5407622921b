"""Stage 2, build: a replayed tree in, checked wheels + SHA256SUMS + provenance out.

Toolchain provisioning, component and engine builds, the artifact check (ELF,
fatbin and wheel readers), and the provenance receipt.
"""
