"""The supervisor's side of the hand-off (docs/operations.md, "How sbxkit run reaches the
supervisor"): ``serve`` (parse, plan, run, judge, reply), ``owner`` (the handed-off run's lease,
owned in-process), ``resume`` (a handed-off run carried on after a crash)."""
