"""Worker scripts run by the engine's Python, one process per rank (see serve/ranks.py).

They import nothing from pinwheel (the engine's venv need not have it): torch,
torch.distributed and, for ``pg_primitives``, a built extension. Each prints one
JSON object as its last stdout line.
"""
