"""How the XLA-vs-eager report writes its figures: each with its interval."""

from __future__ import annotations

import math


def ms(ci: dict | None) -> str:
    """Seconds as milliseconds: median (low-high)."""
    if ci is None:
        return ""
    return f"{ci['median'] * 1e3:.3g} ({ci['low'] * 1e3:.3g}-{ci['high'] * 1e3:.3g})"


def x(ci: dict | None, digits: int = 2) -> str:
    """A ratio or any figure in its own unit: median (low-high)."""
    if ci is None:
        return ""
    return f"{ci['median']:.{digits}f} ({ci['low']:.{digits}f}-{ci['high']:.{digits}f})"


def g(ci: dict, scale: float = 1.0) -> str:
    """A figure to 3 significant digits, scaled: median (low-high); an unbounded high end
    is written as such."""
    if math.isinf(ci["median"]):
        return "none: the term was fitted at 0"
    high = "unbounded" if math.isinf(ci["high"]) else f"{ci['high'] * scale:.3g}"
    dash = " to " if ci["low"] < 0 else "-"
    return f"{ci['median'] * scale:.3g} ({ci['low'] * scale:.3g}{dash}{high})"


def pct(ci: dict) -> str:
    """A share or relative error in percent: median (low to high)."""
    return f"{ci['median']:+.0%} ({ci['low']:+.0%} to {ci['high']:+.0%})"


def share(ci: dict) -> str:
    """A share in percent: median (low-high; "to" where low is negative)."""
    dash = " to " if ci["low"] < 0 else "-"
    return f"{ci['median']:.0%} ({ci['low']:.0%}{dash}{ci['high']:.0%})"


def mib(n: float | None) -> str:
    return "" if n is None else f"{n / 2**20:.1f}"


def first(ci: dict, unit: str = "process") -> str:
    """Seconds from a few samples (fresh processes, repeats): median and, from several,
    the range with its coverage as an interval of the median."""
    if ci["n"] == 1:
        return f"{ci['median']:.2f} (1 {unit})"
    return (
        f"{ci['median']:.2f} ({ci['low']:.2f}-{ci['high']:.2f}; "
        f"{ci['n']} {_PLURAL[unit]}, {ci['confidence']:.0%})"
    )


_PLURAL = {"process": "processes", "repeat": "repeats"}


def mark(result: dict, *parts: str) -> str:
    """ " **(loaded)**" where any of `parts` ran while other processes kept the machine
    busy (result["plan"] says; an earlier lab's report has no plan: nothing)."""
    plan = {p["name"]: p for p in (result.get("plan") or {}).get("parts", [])}
    loaded = any(plan.get(name, {}).get("quiet") is False for name in parts)
    return " **(loaded)**" if loaded else ""


def part_of(workload: str, mode: str) -> tuple[str, ...]:
    """The parts that measure a workload's first calls in `mode`."""
    torch = f"first-calls-{workload}-torch" if mode.startswith("torch") else ""
    return tuple(p for p in (f"first-calls-{workload}", torch) if p)


def figure(result: dict, name: str) -> list[str]:
    """The markdown lines that show the report's PNG `name` ("" around it), or none: the
    PNGs are drawn when the plan's last part is done, so a report with parts still to
    measure has none to show."""
    parts = (result.get("plan") or {}).get("parts", [])
    if any(p["status"] != "done" for p in parts):
        return []
    return [f"![{name.removesuffix('.png')}]({name})", ""]
