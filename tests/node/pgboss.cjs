// pg-boss driven through its own API for tests/config/test_preset_pgboss.py (run from tests/node/pgboss<major>):
//   node pgboss.cjs <major> seed  DSN SCHEMA   -> creates the schema (pg-boss's migrations), the queues
//                                                 and jobs; prints {"ids": {queue: [id...]}}
//   node pgboss.cjs <major> work  DSN SCHEMA RELEASE_FILE   -> real workers until killed
//   node pgboss.cjs <major> truth DSN SCHEMA IDS_JSON       -> getQueueSize and getJobById, as JSON
//   node pgboss.cjs <major> more  DSN SCHEMA IDS_JSON       -> send() to 'emails' jobs that complete,
//                                                 fail, and fail after a retry; their ids added
//   node pgboss.cjs 10 bulk DSN SCHEMA COUNTS_JSON  -> queue 'bulk': insert() `sent` jobs, fetch()
//                                                 `fetched` of them (active), complete() `completed`;
//                                                 prints its getQueueSize (waiting, unfinished)
const path = require('node:path')
const fs = require('node:fs')
const [major, command, dsn, schema, extra] = process.argv.slice(2)
const { PgBoss: Named } = require(path.join(__dirname, `pgboss${major}`, 'node_modules', 'pg-boss'))
const PgBoss = Named || require(path.join(__dirname, `pgboss${major}`, 'node_modules', 'pg-boss'))

const QUEUES = ['emails', 'reports', 'slow', 'idle']

function boss (options = {}) {
  const instance = new PgBoss({ connectionString: dsn, schema, supervise: false, schedule: false, ...options })
  instance.on('error', (error) => console.error(error))
  return instance
}

async function seed () {
  const b = boss()
  await b.start()
  for (const queue of QUEUES) await b.createQueue(queue)
  const ids = Object.fromEntries(QUEUES.map((queue) => [queue, []]))
  const send = async (queue, data, options = {}) => ids[queue].push(await b.send(queue, data, options))
  for (let n = 0; n < 4; n++) await send('emails', { ok: true })
  for (let n = 0; n < 2; n++) await send('emails', { ok: false }, { retryLimit: 0 })
  // fails once, then waits an hour for its retry
  await send('reports', { ok: false }, { retryLimit: 2, retryDelay: 3600 })
  for (let n = 0; n < 3; n++) await send('reports', { ok: true }, { startAfter: 3600 })
  const cancelled = await b.send('reports', { ok: true }, { startAfter: 3600 })
  ids.reports.push(cancelled)
  await b.cancel('reports', cancelled)
  await send('slow', { hold: true })
  for (let n = 0; n < 5; n++) await send('idle', { ok: true })
  await send('idle', { ok: true }, { startAfter: 1 }) // due a second later, never worked
  await b.stop({ graceful: false, wait: true })
  process.stdout.write(JSON.stringify({ ids }))
}

async function work (release) {
  const b = boss()
  await b.start()
  const handler = async ([job]) => {
    if (job.data.hold) {
      while (!fs.existsSync(release)) await new Promise((resolve) => setTimeout(resolve, 50))
      return
    }
    if (!job.data.ok) throw new Error('the job fails on purpose')
  }
  for (const queue of ['emails', 'reports', 'slow']) {
    await b.work(queue, { pollingIntervalSeconds: 0.5 }, handler)
  }
  process.on('SIGTERM', async () => { await b.stop({ graceful: false, wait: false }); process.exit(0) })
  console.error('working')
}

async function more (idsFile) {
  const b = boss()
  await b.start()
  const { ids } = JSON.parse(fs.readFileSync(idsFile, 'utf8'))
  for (let n = 0; n < 3; n++) ids.emails.push(await b.send('emails', { ok: true }))
  ids.emails.push(await b.send('emails', { ok: false }, { retryLimit: 0 }))
  // fails, is retried at once (a retry pg-boss counts in retry_count only) and fails for good
  ids.emails.push(await b.send('emails', { ok: false }, { retryLimit: 1, retryDelay: 0 }))
  await b.stop({ graceful: false, wait: true })
  fs.writeFileSync(idsFile, JSON.stringify({ ids }))
}

async function truth (idsFile) {
  const b = boss({ migrate: false })
  await b.start()
  const { ids } = JSON.parse(fs.readFileSync(idsFile, 'utf8'))
  const sizes = {}
  const jobs = []
  for (const queue of QUEUES) {
    if (b.getQueueSize) { // pg-boss 10 (12 has no live count: getQueueStats reads its cache)
      sizes[queue] = {
        waiting: await b.getQueueSize(queue),
        unfinished: await b.getQueueSize(queue, { before: 'completed' })
      }
    }
    for (const id of ids[queue]) {
      const job = await b.getJobById(queue, id)
      jobs.push({
        queue,
        id,
        state: job.state,
        createdOn: job.createdOn ?? job.created_on,
        startAfter: job.startAfter ?? job.start_after,
        startedOn: job.startedOn ?? job.started_on,
        completedOn: job.completedOn ?? job.completed_on ?? null,
        retryCount: job.retryCount ?? job.retry_count ?? null
      })
    }
  }
  const now = (await b.getDb().executeSql('SELECT extract(epoch from now())::float8 AS now')).rows[0].now
  await b.stop({ graceful: false, wait: true })
  process.stdout.write(JSON.stringify({ sizes, jobs, now }))
}

async function bulk (counts) {
  const { sent, fetched, completed } = JSON.parse(counts)
  const b = boss()
  await b.start()
  await b.createQueue('bulk')
  for (let n = 0; n < sent; n += 1000) {
    await b.insert(Array.from({ length: Math.min(1000, sent - n) }, () => ({ name: 'bulk', data: {} })))
  }
  const active = []
  while (active.length < fetched) {
    const jobs = await b.fetch('bulk', { batchSize: Math.min(1000, fetched - active.length) })
    if (!jobs.length) throw new Error(`fetch() gave ${active.length} of ${fetched} jobs`)
    active.push(...jobs.map((job) => job.id))
  }
  for (let n = 0; n < completed; n += 1000) {
    await b.complete('bulk', active.slice(n, Math.min(completed, n + 1000)))
  }
  const sizes = {
    waiting: await b.getQueueSize('bulk'),
    unfinished: await b.getQueueSize('bulk', { before: 'completed' })
  }
  await b.stop({ graceful: false, wait: true })
  process.stdout.write(JSON.stringify(sizes))
}

const commands = {
  seed,
  bulk: () => bulk(extra),
  work: () => work(extra),
  truth: () => truth(extra),
  more: () => more(extra)
}
commands[command]().catch((error) => { console.error(error); process.exit(1) })
