"""Local fakes of the vendor protocols the pipeline speaks, for tests and load."""
