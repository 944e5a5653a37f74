"""In-memory fakes of the ports (`ckpt_ha.*.port` / `ports`): handler logic runs against these in
unit tests, and each fake passes the same contract suite as its real adapter."""
