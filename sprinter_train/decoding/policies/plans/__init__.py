"""The planners length policies share: the goodput model (`goodput.py`), "play the arm that
measured best" (`arms.py`) as sd's gamma planner (`gamma_plan.py`) and sv's companion plan
(`companion_plan.py`), and the online logistic the online verifier refits (`online_logistic.py`)."""
