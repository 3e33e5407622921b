"""Qualification gates: one table of rows behind one Protocol, one loop over it.

:mod:`pinwheel.serve.gates.base` holds the :class:`~pinwheel.serve.gates.base.GateRule`
Protocol and what a row reads (:class:`~pinwheel.serve.gates.base.Measured` when
qualifying, :class:`~pinwheel.serve.gates.base.Reading` when verify-receipt re-derives a
status); :mod:`pinwheel.serve.gates.table` holds the rows and the loop. Adding a gate is
one module with its row class and one row in ``table.GATES`` (docs/qualify.md).
"""
