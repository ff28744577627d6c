"""What lands on disk: the one publisher (:mod:`~policy_engine.files.publish`), the output
folder's names (:mod:`~policy_engine.files.layout`) and the manifest lines
(:mod:`~policy_engine.files.records`). Imports nothing of the project above it."""
