"""The device VM's stand-in shared by the fake-GPU tests (sitecustomize.py beside this
file, tests/launch/test_serve_gpu_path.py): attached queries run in a reference runtime
over the fake kernel's own records (the fake Megakernel calls `observer.rt.fire`), never
fed by the host; `boundary()` is the tier manager's launch boundary (recorded)."""


class FakeDeviceQueries:
    instances = []

    def __init__(self, mk, tier="hot"):
        from dtrace_mk.runtime.reference import ReferenceRuntime
        self.rt = ReferenceRuntime(num_workers=mk.num_workers)
        mk.observer = self
        self.mk, self.tier = mk, tier
        self.detached = []
        self.boundaries = []            # launches run before each boundary
        FakeDeviceQueries.instances.append(self)

    def attach(self, obj, verify=True, **kw):
        return self.rt.attach(obj, verify=verify)

    def detach(self, aid):
        self.detached.append(aid)
        self.rt.detach(aid)

    def boundary(self):
        self.boundaries.append(getattr(self.mk, "runs", None))

    def maps(self, aid):
        return self.rt.maps(aid)

    def coverage(self, aid):
        return self.rt.coverage(aid)

    def evidence(self, aid):
        return self.rt.evidence(aid)
