-- Cake warehouse, schema version 9: how many candidates per generation a run's cost filter kept by rank.
--
-- `cake evolve --keep N` passes the top N by predicted time (plus one at random and one sampled from those
-- dropped); NULL, as on every row written before, is the default: half the population.

alter table runs add column filter_keep INTEGER;
