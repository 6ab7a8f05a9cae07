"""What every GPU bench writes first: a log that prints and keeps each line, and the card
line (card, SMs, date, commit) that every recorded figure carries (docs/results)."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable


def logger(outdir: Path, name: str, mode: str = "w") -> Callable[[str], None]:
    """log(line): print it and append it to outdir/name (created)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    f = open(outdir / name, mode)

    def log(line: str) -> None:
        print(line, flush=True)
        f.write(line + "\n")
        f.flush()
    return log


def card(cp) -> dict:
    """{"card", "sms", "date", "commit"} of the current CUDA device; commit from
    $DTMK_COMMIT (the GPU runner exports it: the device gets a tree, not a repository)."""
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {"card": name, "sms": dev.attributes["MultiProcessorCount"],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": os.environ.get("DTMK_COMMIT", "unknown")}


def each_preset(names, fn, log) -> list:
    """[fn(name) for each preset name], a failing preset logged with its traceback and
    left out: one preset's failure keeps the others' figures."""
    import traceback
    out = []
    for name in names:
        try:
            out.append(fn(name))
        except Exception as e:  # noqa: BLE001 - keep the other presets' numbers
            log(f"{name}: FAILED {e!r}\n{traceback.format_exc()}")
    return out
