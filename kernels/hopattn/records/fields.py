"""Field checks shared by the record formats: a failure names the file and the field
('results[3].median_ms', 'loop.start') and says what was expected."""

from __future__ import annotations

import math


class Checker:
    def __init__(self, where, error: type[Exception]):
        self.where, self.error = str(where), error

    def fail(self, field: str, expected: str, got=...) -> Exception:
        shown = "<missing>" if got is ... else repr(got)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return self.error(f"{self.where}: field '{field}' must be {expected} (got {shown})")

    def get(self, obj: dict, key: str, field: str, expected: str, ok, nullable=False):
        """obj[key] when ``ok`` accepts it (or it is None and ``nullable``), else the error (a field of
        something that is not an object is missing)."""
        if not isinstance(obj, dict) or key not in obj:
            raise self.fail(field, expected)
        value = obj[key]
        if value is None and nullable:
            return None
        if not ok(value):
            raise self.fail(field, expected, value)
        return value


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def is_text(v) -> bool:
    return isinstance(v, str) and bool(v.strip())


def pos_int(v) -> bool:
    return is_int(v) and v > 0


def nonneg_int(v) -> bool:
    return is_int(v) and v >= 0


def nonneg_num(v) -> bool:
    return is_num(v) and v >= 0


def pos_num(v) -> bool:
    return is_num(v) and v > 0


def counts(v) -> bool:
    """An object of name -> non-negative integer (opcode histograms, group counts)."""
    return isinstance(v, dict) and all(isinstance(k, str) and nonneg_int(n) for k, n in v.items())
