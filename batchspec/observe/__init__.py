"""Reading a run from its output directory alone: status (units by state, live workers) and
reports (per-domain tables, the K controller's view, the run summary)."""
