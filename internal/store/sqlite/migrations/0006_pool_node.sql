-- Warm pools across nodes: the node that keeps a snapshot's warm copies
-- ('' : the snapshot's own node). Another node adopts the pool (fenced)
-- when its node is drained with --move, declared dead or removed.
ALTER TABLE snapshots ADD COLUMN pool_node TEXT NOT NULL DEFAULT '';
