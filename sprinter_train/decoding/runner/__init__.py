"""One model's forwards, in the order a call takes them: the runner front (`runner.py`), the
request it is given and the output it returns (`requests.py`), the backend of its layout
(`backends.py`: dynamic, lean, static), the compiled step (`compile.py`), the capture that
replays a static forward from a graph (`capture.py`), the tail every backend shares (`head.py`),
what follows the warp (`after_warp.py`) and the runner's clock (`clock.py`)."""
