"""A MongoDB query (``find``'s filter) decided outside the server, exactly as the server decides it. Pure.

:func:`compile_query` turns a query document into a :class:`Query` whose :meth:`Query.matches` says
whether ``find(query)`` would return a given document. The rules are mongod's own matcher's (its code,
its reference pages and its jstests, several of which are this module's unit tests):

- a dotted path reaches into sub-documents, and through arrays into each element that is a document; a
  numeric part also names an array's element by position (:mod:`.paths`); a query on a path
  matches when any value the path reaches does;
- where a path ends at an array, the array's elements are candidates and so is the whole array
  (``{a: 1}`` matches ``{a: [1, 2]}``, ``{a: [1, 2]}`` matches ``{a: [1, 2]}`` and ``{a: [[1, 2]]}``);
- comparisons stay within one type bracket (:mod:`.order`): numbers of every type together and
  exactly (NaN equal to NaN only), strings by their bytes (the simple collation), documents field by
  field in order; ``null`` matches null and a missing field, not undefined (MongoDB 8.0);
- the negations (``$ne``, ``$nin``, ``$not``, ``$nor``, ``$exists: false``) negate the whole path's
  answer, not each value's;
- regular expressions are PCRE's (:mod:`.regex`: ASCII ``\\w``/``\\d``/``\\s``/``\\b``, options i, m, s, x).

Supported: implicit equality, ``$eq $ne $gt $gte $lt $lte $in $nin $exists $type $size $mod $regex
$options $not $all $elemMatch $and $or $nor $comment $bitsAllSet $bitsAllClear $bitsAnySet
$bitsAnyClear``. Refused in one line naming the operator, at compile time: what only the server can
decide (``$where $expr $jsonSchema $text $sampleRate``, geo operators), unknown operators, what the
server itself refuses, and what MongoDB versions answer differently: ``null`` on a dotted path (9.0
changed it where the path crosses an array), ``$lt``/``$lte`` MaxKey and ``$gt``/``$gte`` MinKey (their
answer for a missing field), ``$size`` with a fraction, a regex construct Python reads otherwise.
The simple collation is assumed: see :attr:`Query.compares_strings`.
"""

from replicator.query.matcher import LARGE_DOCUMENT, Query, compile_query
from replicator.query.values import TYPE_ALIASES

__all__ = ["LARGE_DOCUMENT", "TYPE_ALIASES", "Query", "compile_query"]
