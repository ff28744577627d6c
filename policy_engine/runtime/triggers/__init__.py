"""Captures beyond the plan: requests of ``policy-engine trigger``, SIGUSR2, slow steps.

- ``step_triggers``: what a role runs on the training thread at each step boundary
  (``StepTriggers``): a clock read, a look at the inbox, the windows of steps wanted.
- ``listener_thread``: the role's listener thread (``ListenerThread``), the only reader of
  requests, and the only one to make a network call or write a file of the channel.
- ``messages``: what the two threads hand each other (inbox and outbox).
- ``channel``, ``ray_actor``, ``folder``: the channel's transports (the job's c10d
  store, a named Ray actor, the ``triggers/`` folder); ``pick`` says which one a job has;
  ``deadline`` makes every call to the store or the actor within a deadline.
- ``requests``: request files and bodies, read as hostile.
- ``parts``: the window of steps wanted, the slow-step detector, the flood throttle.

Imports from ``runtime.process`` only."""
