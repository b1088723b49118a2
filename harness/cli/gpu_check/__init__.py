"""``harness gpu-check``: the harness on a GPU as its users run it, in one table (docs/gpu.md).

:mod:`.prepare` (the verb) chooses a Python whose torch sees a GPU and gives it what it lacks of
the harness's dependencies, from the wheels :mod:`.wheelhouse` made for the GPU machine's Python
and checked; :mod:`.run` runs the :mod:`.steps` there and writes the :mod:`.table`.
:mod:`.rehearse` rehearses that offline install and a dry run on a CPU machine.
"""
