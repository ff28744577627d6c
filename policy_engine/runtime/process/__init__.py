"""What a process holds once, whatever roles it runs: :data:`~.state.STATE` (one slot per
backend, one-time warnings, the capture counter), its manifest file, each role's spent
limits, the background export thread, the exit and SIGTERM/SIGUSR2 hooks, and the worker
that summarises torch traces.

Imports nothing from the rest of the runtime."""
