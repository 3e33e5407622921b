"""pinwheel: pinned, replayable, verified engine builds."""

__version__ = "0.1.0"
