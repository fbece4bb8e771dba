"""Search over npukit's own recipes: the recipe space (``space``), one trial measured on the target (``trial``), the
multi-objective study and its Pareto front (``study``)."""
