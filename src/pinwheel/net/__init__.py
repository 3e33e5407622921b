"""Every wire protocol pinwheel speaks, in one place (the foundation's network layer).

HTTP with its bounds and the one redirect rule (:mod:`pinwheel.net.httpget`); the
stages' clients (``release.download``, ``serve.client``, the object store's backends)
are profiles over it. docs/SECURITY.md names this package as the enforcer of the
network boundary.
"""
