// A small Nacos 2.x naming client on grpc-java (Debian's libgrpc-java), run by
// tests/integration/test_real_clients.py, which compiles it with javac at test time.
//
//   java -cp <classes>:<jars> NacosGrpcClient <host> <grpcPort> <service name>
//
// No protoc: the methods are generic MethodDescriptors over byte[] and the Payload message
// (docs/protocol.md §1.2) is written and read field by field with protobuf-java's coded streams.
// Two connections (each its own ManagedChannel, so its own HTTP/2 transport): a subscriber and a
// publisher. Both do ServerCheck, open the bi stream and send ConnectionSetupRequest (§2.2); the
// subscriber subscribes, the publisher registers (the subscriber must be pushed a
// NotifySubscriberRequest with the instance, and acks it, §3.8), queries, then deregisters (the
// subscriber must be pushed the empty list). Prints one JSON object on stdout and exits 0, or
// prints {"error": ...} and exits 1.

import com.google.gson.Gson;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.protobuf.ByteString;
import com.google.protobuf.CodedInputStream;
import com.google.protobuf.CodedOutputStream;
import com.google.protobuf.WireFormat;
import io.grpc.CallOptions;
import io.grpc.ManagedChannel;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.StreamObserver;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.TreeSet;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;

public final class NacosGrpcClient {
    static final long STEP_TIMEOUT_MS = 15_000;
    static final String GROUP = "DEFAULT_GROUP";
    static final String INSTANCE_IP = "10.9.0.2";
    static final int INSTANCE_PORT = 8082;

    /** Payload bytes in and out as they are: the codec is ours, not a generated class's. */
    static final MethodDescriptor.Marshaller<byte[]> BYTES = new MethodDescriptor.Marshaller<byte[]>() {
        @Override
        public InputStream stream(byte[] value) {
            return new ByteArrayInputStream(value);
        }

        @Override
        public byte[] parse(InputStream stream) {
            try {
                return stream.readAllBytes();
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
    };

    static final MethodDescriptor<byte[], byte[]> UNARY = MethodDescriptor.<byte[], byte[]>newBuilder()
            .setType(MethodDescriptor.MethodType.UNARY)
            .setFullMethodName(MethodDescriptor.generateFullMethodName("Request", "request"))
            .setRequestMarshaller(BYTES).setResponseMarshaller(BYTES).build();

    static final MethodDescriptor<byte[], byte[]> BI_STREAM = MethodDescriptor.<byte[], byte[]>newBuilder()
            .setType(MethodDescriptor.MethodType.BIDI_STREAMING)
            .setFullMethodName(MethodDescriptor.generateFullMethodName("BiRequestStream", "requestBiStream"))
            .setRequestMarshaller(BYTES).setResponseMarshaller(BYTES).build();

    /** A decoded Payload: metadata.type and the JSON body. */
    record Message(String type, JsonObject body) {
    }

    // --- the Payload codec (Metadata: type=3, headers=7, clientIp=8; Payload: metadata=2, body=3;
    // Any: type_url=1, value=2) ---------------------------------------------------------------------

    static byte[] encode(String type, JsonObject body) {
        try {
            ByteString.Output meta = ByteString.newOutput();
            CodedOutputStream m = CodedOutputStream.newInstance(meta);
            m.writeString(3, type);
            m.writeString(8, "127.0.0.1");
            m.flush();
            ByteString.Output any = ByteString.newOutput();
            CodedOutputStream a = CodedOutputStream.newInstance(any);
            a.writeBytes(2, ByteString.copyFromUtf8(body.toString()));
            a.flush();
            ByteString.Output out = ByteString.newOutput();
            CodedOutputStream p = CodedOutputStream.newInstance(out);
            p.writeBytes(2, meta.toByteString());
            p.writeBytes(3, any.toByteString());
            p.flush();
            return out.toByteString().toByteArray();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    static Message decode(byte[] bytes) {
        try {
            String type = "";
            ByteString value = ByteString.EMPTY;
            CodedInputStream in = CodedInputStream.newInstance(bytes);
            for (int tag = in.readTag(); tag != 0; tag = in.readTag()) {
                int field = WireFormat.getTagFieldNumber(tag);
                if (field == 2 && WireFormat.getTagWireType(tag) == WireFormat.WIRETYPE_LENGTH_DELIMITED) {
                    CodedInputStream meta = in.readBytes().newCodedInput();
                    for (int t = meta.readTag(); t != 0; t = meta.readTag()) {
                        if (WireFormat.getTagFieldNumber(t) == 3) {
                            type = meta.readString();
                        } else {
                            meta.skipField(t);
                        }
                    }
                } else if (field == 3 && WireFormat.getTagWireType(tag) == WireFormat.WIRETYPE_LENGTH_DELIMITED) {
                    CodedInputStream any = in.readBytes().newCodedInput();
                    for (int t = any.readTag(); t != 0; t = any.readTag()) {
                        if (WireFormat.getTagFieldNumber(t) == 2) {
                            value = any.readBytes();
                        } else {
                            any.skipField(t);
                        }
                    }
                } else {
                    in.skipField(tag);
                }
            }
            JsonObject body = value.isEmpty() ? new JsonObject()
                    : JsonParser.parseString(value.toStringUtf8()).getAsJsonObject();
            return new Message(type, body);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    // --- one connection -----------------------------------------------------------------------------

    /** One Nacos connection: its own channel (one HTTP/2 transport), unary calls and the bi stream. */
    static final class Connection implements StreamObserver<byte[]> {
        final String name;
        final ManagedChannel channel;
        final List<Message> received = new ArrayList<>();
        final List<String> acked = new ArrayList<>();
        StreamObserver<byte[]> stream;
        Throwable streamError;

        Connection(String name, String host, int port) {
            this.name = name;
            this.channel = NettyChannelBuilder.forAddress(host, port).usePlaintext().build();
        }

        Message call(String type, JsonObject body) {
            body.add("headers", new JsonObject());
            byte[] answer = ClientCalls.blockingUnaryCall(channel, UNARY,
                    CallOptions.DEFAULT.withDeadlineAfter(STEP_TIMEOUT_MS, TimeUnit.MILLISECONDS), encode(type, body));
            return decode(answer);
        }

        synchronized void send(String type, JsonObject body) {
            body.add("headers", new JsonObject());
            stream.onNext(encode(type, body));
        }

        @Override
        public void onNext(byte[] bytes) {
            Message message = decode(bytes);
            String answer = switch (message.type()) {
                case "NotifySubscriberRequest" -> "NotifySubscriberResponse";
                case "ClientDetectionRequest" -> "ClientDetectionResponse";
                default -> null;
            };
            if (answer != null) {
                // Answered on the same stream with the request's id (§2.4).
                String requestId = message.body().get("requestId").getAsString();
                JsonObject ack = new JsonObject();
                ack.addProperty("resultCode", 200);
                ack.addProperty("errorCode", 0);
                ack.addProperty("requestId", requestId);
                send(answer, ack);
                if (answer.equals("NotifySubscriberResponse")) {
                    synchronized (this) {
                        acked.add(requestId);
                    }
                }
            }
            synchronized (this) {
                received.add(message);
                notifyAll();
            }
        }

        @Override
        public synchronized void onError(Throwable error) {
            if (Status.fromThrowable(error).getCode() != Status.Code.CANCELLED) {
                streamError = error;
            }
            notifyAll();
        }

        @Override
        public void onCompleted() {
        }

        synchronized int mark() {
            return received.size();
        }

        /** The first message received since {@code from} that matches, waiting up to the step timeout. */
        synchronized Message waitFor(String what, Predicate<Message> match, int from) throws InterruptedException {
            long deadline = System.currentTimeMillis() + STEP_TIMEOUT_MS;
            while (true) {
                for (Message m : received.subList(from, received.size())) {
                    if (match.test(m)) {
                        return m;
                    }
                }
                if (streamError != null) {
                    throw new IllegalStateException(name + " stream failed: " + streamError);
                }
                long left = deadline - System.currentTimeMillis();
                if (left <= 0) {
                    throw new IllegalStateException(name + ": no " + what + " within " + STEP_TIMEOUT_MS
                            + " ms; got " + received);
                }
                wait(left);
            }
        }

        JsonObject connect() throws InterruptedException {
            JsonObject check = new JsonObject();
            check.addProperty("module", "internal");
            Message answer = call("ServerCheckRequest", check);
            synchronized (this) {
                stream = ClientCalls.asyncBidiStreamingCall(channel.newCall(BI_STREAM, CallOptions.DEFAULT), this);
            }
            JsonObject setup = new JsonObject();
            setup.addProperty("clientVersion", "grpc-java-test");
            setup.addProperty("tenant", "");
            setup.addProperty("module", "internal");
            JsonObject labels = new JsonObject();
            labels.addProperty("source", "sdk");
            labels.addProperty("module", "naming");
            setup.add("labels", labels);
            setup.add("abilityTable", new JsonObject());
            send("ConnectionSetupRequest", setup);
            Message ack = waitFor("SetupAckRequest", m -> m.type().equals("SetupAckRequest"), 0);
            JsonObject out = new JsonObject();
            out.addProperty("serverCheckType", answer.type());
            out.add("connectionId", answer.body().get("connectionId"));
            out.add("setupAck", ack.body());
            return out;
        }

        void close() throws InterruptedException {
            synchronized (this) {
                if (stream != null) {
                    stream.onCompleted();
                }
            }
            channel.shutdownNow();
            channel.awaitTermination(5, TimeUnit.SECONDS);
        }
    }

    // --- the flow -------------------------------------------------------------------------------------

    static JsonObject naming(String service) {
        JsonObject body = new JsonObject();
        body.addProperty("namespace", "public");
        body.addProperty("serviceName", service);
        body.addProperty("groupName", GROUP);
        body.addProperty("module", "naming");
        return body;
    }

    static JsonObject instanceRequest(String service, String type) {
        JsonObject body = naming(service);
        body.addProperty("type", type);
        JsonObject instance = new JsonObject();
        instance.addProperty("ip", INSTANCE_IP);
        instance.addProperty("port", INSTANCE_PORT);
        instance.addProperty("weight", 1.0);
        instance.addProperty("healthy", true);
        instance.addProperty("enabled", true);
        instance.addProperty("ephemeral", true);
        instance.addProperty("clusterName", "DEFAULT");
        JsonObject metadata = new JsonObject();
        metadata.addProperty("client", "grpc-java");
        instance.add("metadata", metadata);
        body.add("instance", instance);
        return body;
    }

    static JsonArray hosts(JsonElement serviceInfo) {
        TreeSet<String> sorted = new TreeSet<>();
        if (serviceInfo != null && serviceInfo.isJsonObject() && serviceInfo.getAsJsonObject().has("hosts")) {
            for (JsonElement h : serviceInfo.getAsJsonObject().getAsJsonArray("hosts")) {
                JsonObject host = h.getAsJsonObject();
                sorted.add(host.get("ip").getAsString() + ":" + host.get("port").getAsInt());
            }
        }
        JsonArray out = new JsonArray();
        sorted.forEach(out::add);
        return out;
    }

    static Predicate<Message> pushWith(JsonArray want) {
        return m -> m.type().equals("NotifySubscriberRequest") && hosts(m.body().get("serviceInfo")).equals(want);
    }

    static JsonObject summary(Message m) {
        JsonObject out = new JsonObject();
        out.addProperty("type", m.type());
        out.add("resultCode", m.body().get("resultCode"));
        out.add("errorCode", m.body().get("errorCode"));
        return out;
    }

    static JsonObject run(String host, int port, String service) throws InterruptedException {
        JsonObject out = new JsonObject();
        out.addProperty("client", "grpc-java");
        out.addProperty("version", io.grpc.ManagedChannel.class.getPackage().getImplementationVersion());
        Connection subscriber = new Connection("subscriber", host, port);
        Connection publisher = new Connection("publisher", host, port);
        try {
            out.add("subscriberConnection", subscriber.connect());
            out.add("publisherConnection", publisher.connect());

            JsonObject sub = naming(service);
            sub.addProperty("subscribe", true);
            sub.addProperty("clusters", "");
            Message subscribed = subscriber.call("SubscribeServiceRequest", sub);
            if (!subscribed.type().equals("SubscribeServiceResponse")) {
                throw new IllegalStateException("subscribe answered " + subscribed);
            }
            JsonObject s = summary(subscribed);
            s.add("hosts", hosts(subscribed.body().get("serviceInfo")));
            out.add("subscribe", s);

            int from = subscriber.mark();
            out.add("register", summary(publisher.call("InstanceRequest", instanceRequest(service, "registerInstance"))));
            JsonArray me = new JsonArray();
            me.add(INSTANCE_IP + ":" + INSTANCE_PORT);
            Message push = subscriber.waitFor("push with the instance", pushWith(me), from);
            JsonObject info = push.body().getAsJsonObject("serviceInfo");
            JsonObject p = new JsonObject();
            p.add("requestId", push.body().get("requestId"));
            p.add("name", info.get("name"));
            p.add("hosts", hosts(info));
            p.add("metadata", info.getAsJsonArray("hosts").get(0).getAsJsonObject().get("metadata"));
            out.add("pushAfterRegister", p);

            JsonObject q = naming(service);
            q.addProperty("cluster", "");
            q.addProperty("healthyOnly", false);
            q.addProperty("udpPort", 0);
            Message queried = publisher.call("ServiceQueryRequest", q);
            JsonObject qs = summary(queried);
            qs.add("hosts", hosts(queried.body().get("serviceInfo")));
            out.add("query", qs);

            from = subscriber.mark();
            out.add("deregister",
                    summary(publisher.call("InstanceRequest", instanceRequest(service, "deregisterInstance"))));
            Message empty = subscriber.waitFor("empty push after deregister", pushWith(new JsonArray()), from);
            JsonObject e = new JsonObject();
            e.add("requestId", empty.body().get("requestId"));
            e.add("hosts", hosts(empty.body().get("serviceInfo")));
            out.add("pushAfterDeregister", e);
            JsonArray acked = new JsonArray();
            synchronized (subscriber) {
                subscriber.acked.forEach(acked::add);
            }
            out.add("acked", acked);
            // One unary round trip on the subscriber's connection after its acks were written:
            // the server has read them before it answers, so none is lost when the client closes.
            JsonObject health = new JsonObject();
            health.addProperty("module", "internal");
            out.add("healthCheck", summary(subscriber.call("HealthCheckRequest", health)));
        } finally {
            subscriber.close();
            publisher.close();
        }
        return out;
    }

    public static void main(String[] args) {
        Gson gson = new Gson();
        try {
            JsonObject out = run(args[0], Integer.parseInt(args[1]), args[2]);
            System.out.println(gson.toJson(out));
            System.out.flush();
            System.exit(0);
        } catch (Throwable error) {
            StringWriter trace = new StringWriter();
            error.printStackTrace(new PrintWriter(trace));
            JsonObject out = new JsonObject();
            out.addProperty("error", trace.toString());
            System.out.println(gson.toJson(out));
            System.out.flush();
            System.exit(1);
        }
    }
}
