"""How much to speculate: the acceptance and step-cost estimator, the K policy that plans
engines over the rest of the work, the measurements shared between workers, and ``tune``."""
