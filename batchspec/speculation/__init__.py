"""How much to speculate: the acceptance and step-cost estimator, the K controller and the K
policy that plans engines over the rest of the work, the measurements shared between workers,
the tuning file they start from, and the routing of ``engine: auto`` jobs. Measuring by running
(``tune``, ``verify``) lives in ``measure``."""
