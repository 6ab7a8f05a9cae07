"""The device VM's stand-in shared by the fake-GPU tests (sitecustomize.py beside this
file, tests/launch/test_serve_gpu_path.py): attached queries run in a reference runtime
over the fake kernel's own records (the fake Megakernel calls `observer.rt.fire`), never
fed by the host; `boundary()` is the tier manager's launch boundary (recorded)."""
from dtrace_mk.runtime.summary_windows import ReferenceDevice


class FakeDeviceQueries(ReferenceDevice):
    """DeviceQueries over the fake kernel: runtime.summary_windows.ReferenceDevice, its
    steps started and finished those of the fake resident launch."""
    instances = []

    def __init__(self, mk, tier="hot"):
        super().__init__(mk.num_workers)
        mk.observer = self
        self.mk, self.tier = mk, tier
        self.boundaries = []            # resident launches run before each boundary
        self.swap_after = None          # swap_pending() once a poll reported this step finished
        self.swapped = 0
        self.retire_calls = []
        FakeDeviceQueries.instances.append(self)

    def swap_pending(self):
        return (self.swap_after is not None and not self.swapped
                and getattr(self.mk, "_reported", 0) >= self.swap_after)

    def unstarted_step(self):
        """The fake kernel runs a step's records into the "device VM" when it is granted."""
        return self.mk._grant if getattr(self.mk, "_active", False) else self.mk.step

    def final_epoch(self):
        """Steps a poll reported finished (after a launch: every step it ran)."""
        return (self.mk._reported if getattr(self.mk, "_active", False) else self.mk.step) - 1

    def boundary(self):
        if self.swap_pending():
            self.swapped += 1
        self.boundaries.append(len(getattr(self.mk, "segments", ())))

    def retire(self):
        """DeviceQueries.retire: the host model has no device slots to free; the tests
        check the loop calls it (the steps the kernel had reported finished then)."""
        self.retire_calls.append(getattr(self.mk, "_reported", 0))
        return 0


class FakeResident:
    """The resident-launch API of gpu.Megakernel (start_resident / grant / poll / stop /
    finish) over per-step records, for the fake-GPU tests of serve_gpu's loop.  The
    "kernel" runs every granted step at once (the device VM, `observer.rt`, sees every
    record as it runs); poll() returns the records per worker (workers one after another,
    so steps interleave, as the real ring read does) and reports a step finished only
    one poll later (records of unfinished steps arrive first).  `drop_every` N: every Nth
    record is refused by the "full ring" (counted, not returned; the VM still sees it;
    `dropped_by_step` says of which steps, for the tests).  `hooks`: a list streams only
    those hooks' records (the kernel's hook mask; the VM still sees every record);
    "all" / None every record.
    The host needs: `_records_of(step)` -> packed records, `_collective(what)`."""
    drop_every = 0
    report_every = 1                    # a poll reports finished steps only every Nth time
    on_done = None                      # called with each poll's finished step

    def _res_init(self):
        self.segments = []              # (first step, stop step) of each resident launch
        self._ran = self._reported = 0
        self._out, self._drops, self._lag = [], 0, False
        self._nrec = self.dropped_total = 0
        self.dropped_by_step = {}
        self._active = False

    def start_resident(self, hooks=None, faults=None, watchdog_ms=2000, window=4, **kw):
        assert not self._active, "a resident launch is already running"
        self._collective("start")
        self._active, self._stopped = True, False
        self._s0 = self._ran = self._reported = self.step
        self._grant = self.step
        from dtrace_mk.abi import definition as D
        self._mask = None if hooks in (None, "all", True) else {D.hook(h).id for h in hooks}
        self.hooks_streamed = hooks
        self.grant(self.step + window)

    @property
    def resident(self):
        return self._active

    def grant(self, until):
        assert self._active and not self._stopped
        if until <= self._grant:
            return
        self._grant = until
        recs = []
        for k in range(self._ran, until):
            for r in self._records_of(k):
                if self.observer is not None:
                    self.observer.rt.fire(r)
                if self._mask is not None and int.from_bytes(r[4:8], "little") not in self._mask:
                    continue                    # not in the host ring's hook mask
                self._nrec += 1
                if self.drop_every and self._nrec % self.drop_every == 0:
                    self._drops += 1
                    self.dropped_total += 1
                    self.dropped_by_step[k] = self.dropped_by_step.get(k, 0) + 1
                else:
                    recs.append(r)
        self._ran = until
        import numpy as np
        from dtrace_mk.megakernel import gpu
        if recs:
            arr = np.frombuffer(b"".join(recs), dtype=gpu.CTX_DTYPE)
            self._out.append(arr[np.lexsort((arr["ts_ns"], arr["worker"]))])
        self._lag = True

    def stop(self):
        self._stopped = True
        return self._grant

    def poll(self):
        import numpy as np
        from dtrace_mk.megakernel import gpu
        out = np.concatenate(self._out) if self._out else np.zeros(0, gpu.CTX_DTYPE)
        self._out = []
        drops, self._drops = self._drops, 0
        done = self._ran - 1 if self._lag and self._ran > self._reported else self._ran
        self._lag = False
        self._polls = getattr(self, "_polls", 0) + 1
        if self._polls % self.report_every:
            done = self._reported                # this poll saw no new finished step
        if self.on_done is not None:
            self.on_done(done)
        self._reported = max(self._reported, done)
        return out, drops, done

    def finish(self, *a, **kw):
        import types
        self.stop()
        recs, drops, _ = self.poll()
        self.step = self._ran
        self._active = False
        self.segments.append((self._s0, self.step))
        self._collective(("finish", self.step))
        return types.SimpleNamespace(hooks=recs, hooks_dropped=drops, elapsed_ms=0.05 * (self.step - self._s0))
