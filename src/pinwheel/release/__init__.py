"""Stage 3 and 4, release and install: wheels in, a signed release out, and back.

Release assembly and signing, fetch with verification, install into a venv,
and the model pack those wheels serve.
"""
