// The BullMQ side of bench/bullmq.py: one Node process, driven by JSON lines on stdin.
//   {"op": door, "n": calls, "round": r}  -> sets the door up, answers {"ready": true}
//   {"go": true}                           -> runs n timed calls, answers {"walls_us": [...]}
//   {"quit": true}                         -> closes everything and exits
// Between "ready" and "go" the Python side resets the server's statistics, so they count the timed calls only.
'use strict';
const readline = require('readline');
const { Queue, Worker } = require('bullmq');

const [host, port] = [process.env.BENCH_REDIS_HOST || '127.0.0.1', Number(process.env.BENCH_REDIS_PORT)];
const connection = { host, port, maxRetriesPerRequest: null };
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');
let pending = null;  // {run: async (i) => ..., n, close: async () => ...}

async function setup(op, n, round) {
  const name = `bq-${op}-${round}`;
  const queue = new Queue(name, { connection });
  await queue.waitUntilReady();
  const closers = [() => queue.close()];
  let run;
  if (op === 'dedup_admit') {
    run = (i) => queue.add('work', { i }, { deduplication: { id: `a-${round}-${i}` } });
  } else if (op === 'dedup_drop') {
    await queue.add('work', { i: 'held' }, { deduplication: { id: 'held' } });
    run = () => queue.add('work', { i: 'held' }, { deduplication: { id: 'held' } });
  } else if (op === 'plain_add') {
    run = (i) => queue.add('work', { i });
  } else if (op === 'fetch') {
    await queue.addBulk(Array.from({ length: n + 1 }, (_, i) => ({ name: 'work', data: { i } })));
    const worker = new Worker(name, null, { connection, autorun: false });
    await worker.waitUntilReady();
    closers.unshift(() => worker.close(true));
    await worker.getNextJob('warm', { block: false });  // the script is loaded before the timed calls
    run = async (i) => {
      const job = await worker.getNextJob(`t-${round}-${i}`, { block: false });
      if (!job) throw new Error('moveToActive found no job');
    };
  } else {
    throw new Error(`unknown op ${op}`);
  }
  if (op !== 'fetch') await run(-1);  // the script is loaded (and, for a drop, the first add holds the id)
  pending = { run, n, close: async () => { for (const close of closers) await close(); } };
}

async function go() {
  const walls = [];
  for (let i = 0; i < pending.n; i++) {
    const start = process.hrtime.bigint();
    await pending.run(i);
    walls.push(Number(process.hrtime.bigint() - start) / 1000);
  }
  await pending.close();
  pending = null;
  return walls;
}

const lines = readline.createInterface({ input: process.stdin });
let chain = Promise.resolve();
lines.on('line', (line) => {
  chain = chain.then(async () => {
    const msg = JSON.parse(line);
    try {
      if (msg.quit) { lines.close(); process.exit(0); }
      if (msg.go) { out({ walls_us: await go() }); return; }
      await setup(msg.op, msg.n, msg.round);
      out({ ready: true });
    } catch (err) {
      out({ error: String(err && err.stack || err) });
    }
  });
});
