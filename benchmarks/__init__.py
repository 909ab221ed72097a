"""fedbug's benchmarks: one subpackage per study, its script(s), config(s), README.md and
results/ side by side (index: benchmarks/README.md). Run a script from the repository root as a
module, e.g. ``python -m benchmarks.speed.speed --quick``; shared helpers are in
:mod:`benchmarks.common`."""
