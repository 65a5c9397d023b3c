"""The serving step loop and its fast paths: :mod:`.core` conducts the loop (``PagedServing``), one step the
reference way is :mod:`.slow_path`, quiet runs of steps planned at once :mod:`.planned_run` (arrivals joining
them :mod:`.joins`, a full fixed pool's squeezed steps :mod:`.squeezed`), and every step's time comes from the
one cost model through :mod:`.costing`."""
