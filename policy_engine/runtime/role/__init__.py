"""What training code holds: the :class:`~.profiler.RoleProfiler` of a role whose plan is
on (one state machine, written once), the :class:`~.off.OffProfiler` of a rank that is
off, regions and wrapped methods (``wrapping``), and the history a role records outside
its captures (``history``: allocator history from the first step).

Imports from ``runtime.process``, ``runtime.capture`` and ``runtime.triggers``."""
