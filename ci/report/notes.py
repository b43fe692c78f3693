"""Where a miss's time goes, the notes of target rows: kernel profiles of both sides, a capture's first size
against each further graph, a pool's growth, a first call's parts, what a call adds over its plan under
cProfile. Sections call them through this module (`notes.capture_note(...)`), so that one patch reaches every
section."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .parts import fmt, own_time
from .results import Results

FIRST_CALL_PARTS = ("first_call", "trace", "split", "load", "compile")  # a start's <part>_seconds


def kernels_note(run: dict[str, Any], key: str, what: str, sides: Sequence[str], first: str) -> str:
    """Where a missed ratio's time goes at `key` (a batch or a serving case) of a latency or serving `run`,
    from its kernel profiles of both `sides`: "<what>: A 255 µs, kernels 225 µs (88% busy) vs B ...; kernels
    only in <first>: ..."; a line saying so where it did not profile both."""
    # here: the report imports torch only for it
    from pieceworks.harness.measure.profile import kernels_only_in

    profiles = [run.get("profiles", {}).get(f"{i}|{key}") for i in sides]
    if not all(profiles):
        return f"{what}: no kernel profile of both sides recorded"
    medians = [run.get("entries", {}).get(f"{i}|{key}", {}).get("median_us") for i in sides]
    only = ", ".join(f"`{n[:48]}` {us:.1f} µs in {c:.0f} launches" for n, us, c in kernels_only_in(*profiles))
    return (
        f"{what}: "
        + " vs ".join(
            f"{i} {fmt(m, 0)} µs, kernels {p['device_us_per_call']:.0f} µs "
            f"({fmt(m and 100 * p['device_us_per_call'] / m, 0)}% busy)"
            for i, m, p in zip(sides, medians, profiles)
        )
        + (f"; kernels only in {first}: {only}" if only else "")
    )


def profile_note(r: Results, where: str, batch: int, impls: list[str]) -> str:
    """`kernels_note` of the latency run `where` ("<model> <dtype>") at `batch`."""
    run = r.details.get(f"latency_{where.replace(' ', '_')}", {})
    return kernels_note(run, str(batch), f"{where} b{batch}", impls, impls[0])


def serving_note(d: dict, case: str, name: str, other: str = "pieceworks-full") -> str:
    """`kernels_note` of a serving run at `case`: PIECEWISE against `other`."""
    return kernels_note(d, case, f"{name} {case}", ("pieceworks-piecewise", other), "PIECEWISE")


def pool_note(what: str, sizes: dict[int, dict]) -> str:
    """Where a pool grows as sizes are added, e.g. "Llama 1B PIECEWISE: pool 54.0 MiB for the largest size,
    54.0 for 8 sizes, 60.0 for 51 (a pool per size: 1534.0)": the smaller sizes' graphs keep memory the
    largest's did not hold."""
    pools = [fmt(sizes[n]["pool_mib"]) for n in (1, 8, 51)]
    return (
        f"{what}: pool {pools[0]} MiB for the largest size, {pools[1]} for 8 sizes, {pools[2]} for 51 "
        f"(a pool per size: {fmt(sizes[51]['unshared_pool_mib'])})"
    )


def capture_note(r: Results, model: str, mode: str) -> str:
    """Where a capture's time goes: the first size (warm-up runs, first allocations) against each further
    graph, e.g. "toy_llama PIECEWISE: 663 graphs; 1 size (13 graphs) 0.27 s, then 1.37 ms a graph; 51 sizes
    1.19 s (23.3 ms a size)", and its cProfile."""
    details = r.details.get("memory" if model == "toy_llama" else f"memory_{model}", {})
    one, all_ = (
        details.get("entries", {}).get(f"{mode}|1", {}),
        details.get("entries", {}).get(f"{mode}|51", {}),
    )
    if (
        not all(
            isinstance(e.get(k), (int, float)) for e in (one, all_) for k in ("capture_seconds", "graphs")
        )
        or all_["graphs"] <= one["graphs"]
    ):
        return ""
    per_graph = (all_["capture_seconds"] - one["capture_seconds"]) / (all_["graphs"] - one["graphs"])
    per_size_ms = 1e3 * all_["capture_seconds"] / 51
    return (
        f"{details.get('model')} {mode}: {all_['graphs']} graphs; 1 size ({one['graphs']} graphs) "
        f"{one['capture_seconds']:.2f} s, then {1e3 * per_graph:.2f} ms a graph; 51 sizes "
        f"{all_['capture_seconds']:.2f} s ({per_size_ms:.1f} ms a size)"
        + host_profile_note(details.get("capture_profiles", {}).get(mode), (per_size_ms, "ms a size"))
    )


def host_profile_note(profile: dict | None, measured: tuple[float, str] | None = None) -> str:
    """ "; under cProfile (4.08 s), own time: ...; own time by whose code runs: torch.fx 0.55 s, ...;
    without pieceworks' own time (1% of the profile): 2.47 s" of a `profile.host_profile` (the owners where
    it recorded them); "" for None. The last clause, where the profile has owners and `measured` gives the
    unprofiled reading `(value, unit)`: that reading with pieceworks' share of the profile taken out, what
    the rest of the code (torch's, its libraries') spends even were pieceworks' free. cProfile slows many
    small Python calls more than a few long built-in ones, so pieceworks' share of a profile is likelier
    above its share of the run than below."""
    if not profile:
        return ""
    owners = profile.get("owners")
    note = f"; under cProfile ({profile['seconds']:.2f} s), own time: " + own_time(
        profile["top"], "tottime_s", "s"
    )
    if owners:
        note += "; own time by whose code runs: " + ", ".join(
            f"{who} {x:.2f} s" for who, x in _top_owners(owners)
        )
        if measured:
            share = owners.get("pieceworks", 0.0) / profile["seconds"]
            value, unit = measured
            rest = fmt(value * (1 - share), 2 if unit == "s" else 1)
            note += f"; without pieceworks' own time ({share:.0%} of the profile): {rest} {unit}"
    return note


def _top_owners(owners: dict[str, float], count: int = 6) -> list[tuple[str, float]]:
    """The `count` owners of most own time, and pieceworks' wherever it ranks."""
    ranked = sorted(owners.items(), key=lambda item: -item[1])
    return ranked[:count] + [item for item in ranked[count:] if item[0] == "pieceworks"]


def first_call_note(what: str, entry: dict) -> str:
    """Where a start's first call went, e.g. "warm: 3.90 s = trace 1.20 + split 0.20 + load 2.10 + compile
    0.00 s", the top of its cProfile where the run profiled it and its own time by whose code ran it
    (`profile.owner`: torch's subpackages, triton, pieceworks, ...), and the first three lines pieceworks
    logged in it (why it traced, compiled or rebuilt kernels; each on one line, cut to 200 characters); ""
    where the run did not record the parts."""
    parts, profile = [entry.get(f"{k}_seconds") for k in FIRST_CALL_PARTS], entry.get("first_call_profile")
    if any(x is None for x in parts):
        return ""
    logged = [
        line if len(line) <= 200 else line[:199] + "…"
        for line in dict.fromkeys(
            " ".join(str(message).split()).replace("|", r"\|") for message in entry.get("log") or []
        )
    ][:3]
    return (
        f"{what}: {parts[0]:.2f} s = "
        + " + ".join(f"{k} {x:.2f}" for k, x in zip(FIRST_CALL_PARTS[1:], parts[1:]))
        + " s"
        + host_profile_note(profile, (entry["first_call_seconds"], "s"))
        + ("; pieceworks logged: " + " / ".join(f'"{line}"' for line in logged) if logged else "")
    )


def call_profile_note(dtype: str, result: dict) -> str:
    """ "<dtype> b1 under cProfile (100 calls each ...): call 61 ms vs plan 48 ms, own time the call adds per
    forward: ..." from the `call_profile` of one dtype of a runtime breakdown; "" where it recorded none."""
    if not (found := result.get("call_profile") or {}).get("added"):
        return ""
    call, plan = (1e3 * found["seconds"][side] for side in ("compiled call", "plan run"))
    return (
        f"{dtype} b{found['batch']} under cProfile ({found['calls']} calls each, profiler overhead "
        f"included): call {call:.0f} ms vs plan {plan:.0f} ms, own time the call adds per forward: "
        + own_time(found["added"], "us_per_call", "µs", "calls_per_call")
    )
