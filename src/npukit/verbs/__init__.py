"""The verbs, one module each: each loads its inputs, runs the stages and builds its report; ``npukit.api``
gathers them as the Python API and ``npukit.cli`` maps the command line onto them."""
