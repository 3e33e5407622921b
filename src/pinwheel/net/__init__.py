"""Every wire protocol pinwheel speaks, in one place (the foundation's network layer).

HTTP with its bounds and the one redirect rule (:mod:`pinwheel.net.httpget`); the
stages' clients (``release.download``, ``serve.client``, the object store's backends)
are profiles over it. docs/SECURITY.md names this package as the enforcer of the
network boundary.
"""

from pinwheel.errors import PinwheelError


class Unavailable(PinwheelError):
    """The peer could not answer (unreachable, refused, cut off, or an answer that is
    not what its protocol promises): for a store, no store for this step."""
