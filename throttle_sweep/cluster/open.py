"""Opening a sweep's pool: this machine's slots, or Ray actors; the one place a command turns its settings
into running slots and a way to close them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from throttle_sweep.cluster.pool import LocalPool
from throttle_sweep.cluster.slot import WarmSlot

if TYPE_CHECKING:
    from throttle_sweep.settings.sweep import SweepRun


def make_pool(run: SweepRun, *, say: Callable[[str], None], starts: Sequence[tuple[str, Mapping[str, Any]]] = ()):
    """This machine's slots (`slots`), or Ray actors (ray_pool.py) when ray.enabled; the pool and its closer."""
    if run.ray is not None:
        from throttle_sweep.cluster.ray_pool import make_ray_pool

        return make_ray_pool(run.ray, run.engine, run.spec, run.price, engine_flags=run.measurement["engine"] or {},
                             warm=run.warm, run_id=run.name, out=run.out, say=say, starts=starts)
    count, why = run.local_slots
    if count > 1:
        say(f"{count} slots on this machine ({why}; slots=1 for one): each comparison runs all its replicates on "
            "one slot, side by side with the others")
    # a slot reads the environment where its engines run: the driver need not import vLLM
    slots = [WarmSlot(run.engine, run.spec, run.price, run_id=run.name, name=f"local-{i}", **run.warm)
             for i in range(count)]
    for slot in slots:
        slot.warm_up()
    pool = LocalPool([slot.measure for slot in slots])

    def close() -> None:
        pool.close()
        for slot in slots:
            slot.close()  # a replicate under way on a slot's thread ends with its engine process
        pool.join()

    return pool, close
