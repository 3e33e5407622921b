"""The wheel-set contract: what a set of wheels is, how it is checked and described.

A wheel set is wheels + SHA256SUMS + provenance.json. This package owns the
provenance receipt (writer and typed reader), the artifact check and its readers
(wheel archive, ELF, fatbin, glibc floor, platform tag), the one publishing path
(`wheelset.publish`), and the stated toolchain substitutions. The compile stage
produces wheels through it; release and serve read wheel sets through it, never
through the compiler.
"""
