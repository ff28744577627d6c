"""The runtime interpreter: carries out a Plan inside the training process.

Its sub-packages, each importing only those before it (and the layers below the runtime):

- ``process/``: what a process holds once, whatever its roles: the slots and one-time
  warnings (``state``), the manifest file it appends to (``manifest``), the limits spent
  per role (``budget``), the background export thread (``export``), the exit and signal
  hooks (``signals``) and the summary worker (``summaries``).
- ``capture/``: one capture's life, from open to close: the backend session driven
  through the schedule's actions (``driver``), its cycles, regions and home thread, the
  manifest lines it writes (``lines``) and why it recorded less than planned
  (``shortfall``).
- ``triggers/``: captures beyond the plan: what a role notices at each step boundary
  (``step_triggers``, training thread), the thread that reads every request and talks to
  the job's channel (``listener_thread``) and the channel's transports (c10d store, Ray
  actor, ``triggers/`` folder).
- ``role/``: what training code holds: the role profiler and its state machine
  (``profiler``), the profiler of a rank that is off (``off``), regions and wrapped
  methods (``wrapping``) and the history a role keeps outside captures (``history``).

``apply.py`` is where training code comes in: ``apply_policy`` and ``profile_session``.
"""
