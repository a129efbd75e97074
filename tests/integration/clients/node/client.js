'use strict';
// A small Nacos 2.x naming client on @grpc/grpc-js, run by tests/integration/test_real_clients.py.
//
//   node client.js <host:grpcPort> <path of nacos_grpc_service.proto> <service name>
//
// Two connections (each its own channel and HTTP/2 transport): a subscriber and a publisher. Both
// do ServerCheck, open the bi stream and send ConnectionSetupRequest (docs/protocol.md §2.2), then
// the subscriber subscribes, the publisher registers (the subscriber must be pushed a
// NotifySubscriberRequest with the instance, and acks it, §3.8), the publisher queries, then
// deregisters (the subscriber must be pushed the empty list). It prints one JSON object with what
// it saw on stdout and exits 0, or prints {"error": ...} and exits 1.

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [target, protoPath, service] = process.argv.slice(2);
const GROUP = 'DEFAULT_GROUP';
const NAMESPACE = 'public';
const INSTANCE = { ip: '10.9.0.1', port: 8081 };
const STEP_TIMEOUT_MS = 15000;

const definition = protoLoader.loadSync(protoPath, { keepCase: true, longs: String, defaults: true });
const proto = grpc.loadPackageDefinition(definition);

function payload(type, body) {
  return {
    metadata: { type, clientIp: '127.0.0.1', headers: {} },
    body: { type_url: '', value: Buffer.from(JSON.stringify({ headers: {}, ...body }), 'utf8') },
  };
}

function parse(message) {
  const value = message.body && message.body.value;
  return { type: message.metadata.type, body: value && value.length ? JSON.parse(value.toString('utf8')) : {} };
}

function hostsOf(serviceInfo) {
  if (!serviceInfo) {
    return null;
  }
  return (serviceInfo.hosts || []).map((h) => `${h.ip}:${h.port}`).sort();
}

/** One Nacos connection: a channel of its own, its unary stub and its bi stream. */
class Connection {
  constructor(name) {
    this.name = name;
    // A local subchannel pool keeps the two connections on two HTTP/2 transports: Nacos ties a
    // connection to its transport (§2.1), and grpc-js shares one per target by default.
    // The unary stub and the stream stub share that one channel: ServerCheck, the stream and
    // every later request of a connection travel on the same transport.
    const options = { 'grpc.use_local_subchannel_pool': 1 };
    this.unary = new proto.Request(target, grpc.credentials.createInsecure(), options);
    this.bi = new proto.BiRequestStream(target, grpc.credentials.createInsecure(),
      { channelOverride: this.unary.getChannel() });
    this.received = [];
    this.waiters = [];
    this.acked = [];
    this.writes = [];
    this.stream = null;
  }

  call(type, body) {
    return new Promise((resolve, reject) => {
      const deadline = new Date(Date.now() + STEP_TIMEOUT_MS);
      this.unary.request(payload(type, body), { deadline }, (err, response) => {
        if (err) {
          reject(new Error(`${this.name} ${type}: ${err.code} ${err.details}`));
        } else {
          resolve(parse(response));
        }
      });
    });
  }

  openStream() {
    this.stream = this.bi.requestBiStream();
    this.stream.on('data', (message) => this.onServerRequest(parse(message)));
    this.stream.on('error', (err) => {
      if (err.code !== grpc.status.CANCELLED) {
        this.fail(new Error(`${this.name} stream: ${err.code} ${err.details}`));
      }
    });
  }

  onServerRequest(message) {
    const { type, body } = message;
    if (type === 'NotifySubscriberRequest' || type === 'ClientDetectionRequest') {
      // Answer on the same stream with the request's id (§2.4); a push ack is a NotifySubscriberResponse.
      const answer = type === 'NotifySubscriberRequest' ? 'NotifySubscriberResponse' : 'ClientDetectionResponse';
      this.writes.push(new Promise((resolve) => {
        this.stream.write(payload(answer, { resultCode: 200, errorCode: 0, requestId: body.requestId }), resolve);
      }));
      if (type === 'NotifySubscriberRequest') {
        this.acked.push(body.requestId);
      }
    }
    this.received.push(message);
    for (const waiter of this.waiters.slice()) {
      waiter.check();
    }
  }

  fail(err) {
    for (const waiter of this.waiters.slice()) {
      waiter.reject(err);
    }
  }

  /** How many messages have arrived so far: a starting point for waitFor. */
  mark() {
    return this.received.length;
  }

  /** The first message received since the mark ``from`` (already or later) for which match() is true. */
  waitFor(what, match, from = 0) {
    return new Promise((resolve, reject) => {
      const waiter = {
        check: () => {
          const found = this.received.slice(from).find(match);
          if (found) {
            clearTimeout(timer);
            this.waiters.splice(this.waiters.indexOf(waiter), 1);
            resolve(found);
          }
        },
        reject: (err) => {
          clearTimeout(timer);
          reject(err);
        },
      };
      const timer = setTimeout(() => {
        this.waiters.splice(this.waiters.indexOf(waiter), 1);
        reject(new Error(`${this.name}: no ${what} within ${STEP_TIMEOUT_MS} ms; got ${JSON.stringify(this.received)}`));
      }, STEP_TIMEOUT_MS);
      this.waiters.push(waiter);
      waiter.check();
    });
  }

  async connect() {
    const check = await this.call('ServerCheckRequest', { module: 'internal' });
    this.openStream();
    this.stream.write(payload('ConnectionSetupRequest', {
      clientVersion: 'grpc-js-test', tenant: '', module: 'internal',
      labels: { source: 'sdk', module: 'naming' }, abilityTable: {},
    }));
    const ack = await this.waitFor('SetupAckRequest', (m) => m.type === 'SetupAckRequest');
    return { serverCheckType: check.type, connectionId: check.body.connectionId, setupAck: ack.body };
  }

  /**
   * Wait until every answer written on the stream has been handed to the transport, then make one
   * unary round trip on the same connection: the server has read the answers before it answers
   * that, so no ack is lost when the client closes straight after.
   */
  async flush() {
    await Promise.all(this.writes);
    return this.call('HealthCheckRequest', { module: 'internal' });
  }

  close() {
    if (this.stream) {
      this.stream.cancel();
    }
    this.unary.close();
  }
}

function naming(extra) {
  return { namespace: NAMESPACE, serviceName: service, groupName: GROUP, module: 'naming', ...extra };
}

function instanceBody(type) {
  return naming({
    type,
    instance: {
      ...INSTANCE, weight: 1.0, healthy: true, enabled: true, ephemeral: true, clusterName: 'DEFAULT',
      metadata: { client: 'grpc-js' },
    },
  });
}

function pushWith(hosts) {
  const want = JSON.stringify(hosts);
  return (m) => m.type === 'NotifySubscriberRequest' && JSON.stringify(hostsOf(m.body.serviceInfo)) === want;
}

async function main() {
  const subscriber = new Connection('subscriber');
  const publisher = new Connection('publisher');
  const out = { client: 'grpc-js', version: require('@grpc/grpc-js/package.json').version };
  try {
    out.subscriberConnection = await subscriber.connect();
    out.publisherConnection = await publisher.connect();

    const sub = await subscriber.call('SubscribeServiceRequest', naming({ subscribe: true, clusters: '' }));
    out.subscribe = { type: sub.type, resultCode: sub.body.resultCode, hosts: hostsOf(sub.body.serviceInfo) };
    if (sub.type !== 'SubscribeServiceResponse') {
      throw new Error(`subscribe answered ${JSON.stringify(sub)}`);
    }

    let from = subscriber.mark();
    const reg = await publisher.call('InstanceRequest', instanceBody('registerInstance'));
    out.register = { type: reg.type, resultCode: reg.body.resultCode, errorCode: reg.body.errorCode };
    const me = `${INSTANCE.ip}:${INSTANCE.port}`;
    const push = await subscriber.waitFor('push with the instance', pushWith([me]), from);
    const pushed = push.body.serviceInfo.hosts[0];
    out.pushAfterRegister = {
      requestId: push.body.requestId, name: push.body.serviceInfo.name, hosts: hostsOf(push.body.serviceInfo),
      metadata: pushed.metadata,
    };

    const query = await publisher.call('ServiceQueryRequest', naming({ cluster: '', healthyOnly: false, udpPort: 0 }));
    out.query = { type: query.type, resultCode: query.body.resultCode, hosts: hostsOf(query.body.serviceInfo) };

    from = subscriber.mark();
    const dereg = await publisher.call('InstanceRequest', instanceBody('deregisterInstance'));
    out.deregister = { type: dereg.type, resultCode: dereg.body.resultCode, errorCode: dereg.body.errorCode };
    const empty = await subscriber.waitFor('empty push after deregister', pushWith([]), from);
    out.pushAfterDeregister = { requestId: empty.body.requestId, hosts: hostsOf(empty.body.serviceInfo) };
    out.acked = subscriber.acked;
    const health = await subscriber.flush();
    out.healthCheck = { type: health.type, resultCode: health.body.resultCode };
  } finally {
    subscriber.close();
    publisher.close();
  }
  return out;
}

main().then(
  (out) => {
    process.stdout.write(`${JSON.stringify(out)}\n`);
    process.exit(0);
  },
  (err) => {
    process.stdout.write(`${JSON.stringify({ error: String(err && err.stack ? err.stack : err) })}\n`);
    process.exit(1);
  },
);
