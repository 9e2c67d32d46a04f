#!/usr/bin/env python3
"""The net cost of drafts in one `gizllm bench --trace` run, in the run's own step times.

Each decode step's time without its drafts and with them are taken from the run's lowest decile
of steps of that many rows (interpolated for a count never run), so the machine's other load,
which only adds time, does not decide it. Extra: the time steps with drafts took beyond the same
steps without them. Saved: each kept draft is a token that needed no step of its own (its
sequence's share of a step without drafts). Net: (extra - saved) over the decode time without
drafts. Usage: draft_cost.py TRACE.jsonl
"""
import collections
import json
import sys

lines=[json.loads(l) for l in open(sys.argv[1])]
t=collections.defaultdict(list)
for j in lines:
    if j["prompt_rows"]==0: t[j["rows"]].append(j["runner_ms"])
low={r:sorted(v)[max(0,len(v)//10)] for r,v in t.items()}
def T(r):
    if r in low: return low[r]
    ks=sorted(low); below=[k for k in ks if k<r]; above=[k for k in ks if k>r]
    if below and above:
        a,b=below[-1],above[0]; return low[a]+(low[b]-low[a])*(r-a)/(b-a)
    return low[below[-1]] if below else low[above[0]]
decode=[j for j in lines if j["prompt_rows"]==0]
base_total=sum(T(j["rows"]-j["drafted"]) for j in decode)
extra=sum(T(j["rows"])-T(j["rows"]-j["drafted"]) for j in decode if j["drafted"])
# a kept draft saves one generating sequence's share of a step without drafts
saved=sum(j["accepted"]*T(j["rows"]-j["drafted"])/max(1,j["rows"]-j["drafted"]) for j in decode if j["accepted"])
print("decode steps %d, with drafts %d, drafted %d, kept %d; extra %.1f ms, saved %.1f ms, of %.1f ms: net %+.1f%%"%(
 len(decode), sum(1 for j in decode if j["drafted"]), sum(j["drafted"] for j in decode), sum(j["accepted"] for j in decode),
 extra, saved, base_total, 100*(extra-saved)/base_total))
