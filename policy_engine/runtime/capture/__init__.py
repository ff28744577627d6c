"""One capture's life: opened by a role, driven through its schedule's actions
(:class:`~.driver.Capture`: the session, its cursor and the one table of transitions),
its cycles and their names, the regions and ranges inside it, the thread it belongs to,
the ``trace`` and ``close`` lines it writes, and why it recorded less than planned.

Imports from ``runtime.process`` only."""
