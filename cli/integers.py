"""Numbers typed on the command line, read as the console reads a client's (console/integers.py):
ASCII digits only ('²' is a digit to str.isdigit() and no number to int(); int() reads '٣' and
' 3\\n'), at most 20 of them. The CLI imports nothing of the console, hence this copy."""

import re

_WHOLE = re.compile(r"[0-9]{1,20}")


def whole(text: str, maximum: int = 2**63 - 1) -> int | None:
    """The whole number `text` spells, up to `maximum`; None when it spells none."""
    if not _WHOLE.fullmatch(text) or int(text) > maximum:
        return None
    return int(text)
