"""Stage 5, serve: an installed engine in, a qualification receipt out.

Preflight of the GPU box, the serve recipe, the client for a running server,
needle prompts, qualification against the manifest's gates, and the report.
"""
