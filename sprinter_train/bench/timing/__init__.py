"""What the bench's clock rests on: the latency profile (`latency.py`) and its check against
the run's own forwards (`profile_check.py`), the floor under a draft step (`step_floor.py`)
and the energy counters (`energy.py`)."""
