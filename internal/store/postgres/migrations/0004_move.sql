-- lizard nodes drain --move: the node's own membership loop sees move set
-- on its row, moves its sandboxes to other nodes and clears it.
ALTER TABLE nodes ADD COLUMN move BOOLEAN NOT NULL DEFAULT false;
