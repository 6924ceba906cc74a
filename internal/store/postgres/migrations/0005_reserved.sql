-- Reserved for the template distribution migration (helper tmpldist); the
-- lead replaces this file with theirs when merging. A no-op until then.
SELECT 1;
