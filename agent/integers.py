"""Integers from the agent's clients (the console, a browser's terminal through it, the command
line): one reading for all of them, the console's (console/integers.py) copied, as the agent
imports nothing of the console.

ASCII digits only (``int()`` also reads '٣', '１', ' 3' and '3\\n'; ``str.isdigit()`` says yes
to '²', which ``int()`` refuses), a leading minus only where the bounds allow negatives, no
space, newline or NUL, at most 20 digits, within the bounds; anything else is a
``NotAWholeNumber`` whose message says in words what is expected."""

import re

LARGEST = 2**63 - 1
_UNSIGNED = re.compile(r"[0-9]{1,20}")
_SIGNED = re.compile(r"-?[0-9]{1,20}")
PID = re.compile(r"[0-9]{1,10}")  # a /proc entry that is a process


class NotAWholeNumber(ValueError):
    """The text is not a whole number within the bounds; the message says what is."""


def parse(text, *, minimum: int = 0, maximum: int = LARGEST) -> int:
    """The whole number `text` spells, from `minimum` to `maximum`; NotAWholeNumber else."""
    shape = _SIGNED if minimum < 0 else _UNSIGNED
    if isinstance(text, str) and shape.fullmatch(text):
        value = int(text)
        if minimum <= value <= maximum:
            return value
    raise NotAWholeNumber(f"A whole number from {minimum} to {maximum}.")


def json_int(value, *, minimum: int = 0, maximum: int = LARGEST) -> int:
    """A JSON number that must be whole (an int, not a bool), within the bounds."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return parse(value, minimum=minimum, maximum=maximum)
