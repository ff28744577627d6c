"""The policy language: text -> document with positions -> problems -> frozen Policy.

Nothing here imports torch."""
