"""Where a process sits, and the plan compiled for one role on it: what it captures
and how each trace is named. explain and nsys-args are views of it."""
