"""One bench run, in order: what it loads and decides first (`prepare.py`), among it the
latency profile and sd's gamma (`profile_and_gamma.py`) and the draft's acceptance rate
(`alpha.py`); the methods built from the config (`methods.py`), every method on every prompt
group (`decode.py`, `runs.py`), results.json's figures (`results.py`), the set-up phases'
times (`phases.py`) and what the run was measured under (`provenance.py`)."""
