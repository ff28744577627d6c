"""What a capture covers: the role that owns it, its outer steps, the roles that joined.

Changed only through its methods, by the owner's profiler (a merged capture goes on
into the next outer step; a colocated role joins the capture running on its backend).
"""

from __future__ import annotations


class Span:
    """The outer steps and roles of one capture."""

    __slots__ = ("joined", "last_step", "owner", "steps")

    def __init__(self, owner: str, steps: list[int], last_step: int | None) -> None:
        self.owner = owner
        self.steps = steps
        self.last_step = last_step  # the last outer step this capture may cover (merged)
        self.joined: list[str] = []  # other roles whose steps ran inside it

    def add_step(self, n: int) -> None:
        """A merged capture goes on into outer step ``n``."""
        self.steps.append(n)

    def join(self, role: str) -> bool:
        """``role`` runs inside this capture; False when it owns it or joined already."""
        if role == self.owner or role in self.joined:
            return False
        self.joined.append(role)
        return True

    def goes_on_into(self, n: int) -> bool:
        """Whether outer step ``n`` continues this capture (merged steps)."""
        return self.steps[-1] == n - 1 and (self.last_step is None or n <= self.last_step)
