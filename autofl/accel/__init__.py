"""What makes the engine fast, behind the `autofl.engine.executor.Executor` seam: the vectorized
executor (all sampled clients stacked and stepped in lockstep), compiled steps, CUDA graphs kept
across rounds, and probed linear-weight updates. A method author never needs to read this package:
the reference executor (autofl.engine.sequential) defines what every executor here computes."""
