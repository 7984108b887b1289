-- Cake warehouse, schema version 5: whether a run filtered its candidates by the cost model.
--
-- A run started with --no-filter times every candidate that compiled (its predictions are still recorded,
-- with decision 'kept', so the model can be graded on everything it saw). Rows written before read NULL:
-- those runs filtered.

alter table runs add column cost_filter BOOLEAN;
